"""The what-if projection drawn (engine.analysis.whatif): the step at another matrix rate,
always labelled a projection with what it assumes. Shared by Kernels, Live and Compare."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.analysis.whatif import projection_rows, rate_words
from engine.display import NA, share_text
from pages.ui import plain

TITLE = "What if the matrix work ran at another rate? (a projection)"


def draw_projection(proj: dict, key: str) -> None:
    if "none" in proj:
        st.caption(f"No projection: {plain(proj['none'])}.")
        return
    current = proj["current"]
    convs = (f" Convolutions are {share_text(current['conv_share'])} of it, projected at "
             "their own rate where this CPU's oneDNN probe measured one (the basis says)."
             if current.get("conv_share") else "")
    st.caption(plain(f"Today: {current['dtype']} matrix work, against a "
                     f"{rate_words(current['flops_per_s'])} peak ({current['basis']}). This is "
                     f"{proj['assumes']}.{convs}"))
    st.dataframe(pd.DataFrame(projection_rows(proj)), hide_index=True, key=key, placeholder=NA)
