"""The login node's stage: everything a study reads from the Hugging Face Hub, into one cache."""
