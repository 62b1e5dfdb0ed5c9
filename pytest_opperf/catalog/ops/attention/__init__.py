"""The attention ops: prefill and decode with grouped-query heads, paged decode, MLA decode."""
