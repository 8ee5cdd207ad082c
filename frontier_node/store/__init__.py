"""Durable homes for the journal and item rows; `open_store(url)` picks one by URL scheme."""
