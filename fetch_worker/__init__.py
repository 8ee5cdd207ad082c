"""The stateless fetch worker: SSRF-safe fetching, link extraction and WARC output for leased URLs."""
