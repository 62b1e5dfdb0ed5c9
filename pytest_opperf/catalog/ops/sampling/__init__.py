"""The ops over the vocabulary logits: sampling and the cross-entropy loss."""
