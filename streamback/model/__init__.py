"""The model: the Llama 3 decoder, its residual-stream formats and roundings, the reversible stream, and the trained
model's file and Hugging Face export."""
