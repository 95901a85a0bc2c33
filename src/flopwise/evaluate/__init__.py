"""`flopwise eval`: perplexity on local files and lm-evaluation-harness tasks, for a run, an export or an HF folder."""
