"""Text -> sentence vectors: the frozen Hugging Face encoder, how models are found and loaded,
and the poolings."""
