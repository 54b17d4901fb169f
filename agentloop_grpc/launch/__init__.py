"""Process management: start engine and tool servers (on this node, or over a Ray cluster), wait until they serve,
write the discovery file, stop them."""
