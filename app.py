"""Precision Lab: page config, navigation and the sidebar device card. Nothing else."""

from pathlib import Path

import streamlit as st

from pages.ui import MODE_ICONS, cached_devices, fmt_bytes

st.set_page_config(page_title="Precision Lab", page_icon="🎯", layout="wide")

_PAGES = [
    ("pages/launch.py", "Launch", ":material/rocket_launch:"),
    ("pages/live.py", "Live", ":material/monitoring:"),
    ("pages/runs.py", "Runs", ":material/table_rows:"),
    ("pages/compare.py", "Compare", ":material/compare_arrows:"),
    ("pages/kernels.py", "Kernels", ":material/memory:"),
    ("pages/check.py", "GPU check", ":material/health_and_safety:"),
]
_ROOT = Path(__file__).parent
pages = [st.Page(path, title=title, icon=icon, default=(path == "pages/launch.py"))
         for path, title, icon in _PAGES if (_ROOT / path).exists()]
navigation = st.navigation(pages)


def device_card() -> None:
    devices = cached_devices()
    gpus = [d for d in devices if d.kind == "cuda"]
    with st.sidebar:
        st.markdown("### Devices")
        if not gpus:
            st.caption("No NVIDIA GPU found (no NVML driver, or a CPU-only PyTorch build): "
                       "runs use the CPU; GPU-only modes are marked unsupported.")
        for dev in (gpus or []) + [d for d in devices if d.kind == "cpu"]:
            memory = fmt_bytes(dev.memory_bytes) if dev.memory_bytes else "n/a"
            st.markdown(f"**{dev.name}**  \n`{dev.key}` · {dev.capability} · {memory}")
            with st.expander("What each precision mode means here", expanded=False):
                for mode, support in dev.modes.items():
                    st.markdown(f"{MODE_ICONS[support.status]} **{mode}** "
                                f"({support.status}): {support.reason}")


device_card()
navigation.run()
