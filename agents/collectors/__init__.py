"""Collectors: what a node agent reads from its hardware, behind one reader interface."""
