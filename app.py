"""Precision Lab: page config, navigation and the sidebar device card (pages/shell.py)."""

from pages.shell import app_shell

app_shell().run()
