"""What the client and the server sides both use: domain types, prompt ids, the error classes (each with its status
code), wire mappings, the tokenizer fingerprint, the model files and the bubblewrap jail (``jail.py``: the one
builder of bwrap command lines). Nothing here imports server code."""
