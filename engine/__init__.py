"""Precision Lab engine: everything that is not UI. Never imports streamlit."""

__version__ = "0.1.0"
