"""Data: sources → tokenize + pack (`yxanul prepare`) → token shards → `WindowLoader`."""
