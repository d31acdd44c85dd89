"""Data files shipped with the load generator (the `flotilla up --demo` trace slice)."""
