"""The app shell: page config, navigation and the sidebar device card.

app.py calls it on every run (pages/ui.ensure_app_shell covers the one case where
Streamlit would run a page without app.py: its legacy `pages/` folder mode).
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from engine.analysis.cpu_evidence import mode_words
from engine.display import memory_text
from engine.support import torch_support
from pages.ui import MODE_COLOURS, SHELL_KEY, cached_devices, coloured, plain

PAGES = [
    ("pages/launch.py", "Launch", ":material/rocket_launch:"),
    ("pages/live.py", "Live", ":material/monitoring:"),
    ("pages/runs.py", "Runs", ":material/table_rows:"),
    ("pages/compare.py", "Compare", ":material/compare_arrows:"),
    ("pages/sweep.py", "Sweep", ":material/grid_view:"),
    ("pages/kernels.py", "Kernels", ":material/memory:"),
    ("pages/check.py", "GPU check", ":material/health_and_safety:"),
]
_ROOT = Path(__file__).resolve().parent.parent


def app_shell():
    """Configure the page, declare the navigation, draw the device card; return the
    page the URL asks for (the caller runs it)."""
    st.set_page_config(page_title="Precision Lab", page_icon=":material/speed:", layout="wide")
    pages = [st.Page(path, title=title, icon=icon, default=(path == "pages/launch.py"))
             for path, title, icon in PAGES if (_ROOT / path).exists()]
    navigation = st.navigation(pages)
    device_card()
    st.session_state[SHELL_KEY] = True
    return navigation


def device_card() -> None:
    devices = cached_devices()
    gpus = [d for d in devices if d.kind == "cuda"]
    torch = torch_support()  # package metadata only: the server imports no torch
    with st.sidebar:
        st.markdown("### Devices")
        if torch.problem:
            st.error(plain(torch.problem))
        elif torch.warning:
            st.warning(plain(torch.warning))
        if not gpus:
            st.caption("No NVIDIA GPU found (no NVML driver, or a CPU-only PyTorch build): "
                       "runs use the CPU; GPU-only modes are marked unsupported.")
        for dev in (gpus or []) + [d for d in devices if d.kind == "cpu"]:
            memory = memory_text(dev.memory_bytes)
            st.markdown(
                f"**{plain(dev.name)}**  \n`{dev.key}` · {plain(dev.capability)} · {memory}"
            )
            with st.expander("What each precision mode means here", expanded=False):
                for mode in dev.modes:
                    words = mode_words(dev, mode)  # a CPU's: flags apart from the probe
                    colour = MODE_COLOURS.get(words["tone"], MODE_COLOURS.get(words["status"]))
                    st.markdown(f"**{mode}** {coloured(words['badge'], colour)}: "
                                f"{plain(words['words'])}")
