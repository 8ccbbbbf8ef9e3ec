"""CLI command modules: each parses options, calls the library and prints. No logic of their own."""
