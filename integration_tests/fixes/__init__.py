"""One folder per fix: its ``fix.toml`` (metadata and proof cells) and its
proof tests."""
