"""Built-in tools: calculator (a real arithmetic parser), check_answer (reward), python (sandboxed)."""
