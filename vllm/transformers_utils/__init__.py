"""Model configs read from Hugging Face `config.json` files."""
