"""What the client and the server sides both use: domain types, prompt ids, the error classes (each with its status
code), wire mappings, the tokenizer fingerprint and the model files. Nothing here imports server code."""
