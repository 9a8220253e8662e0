"""Training npmdb's encoder with NPM's objective (span masking + contrastive losses)."""
