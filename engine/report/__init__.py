"""Reports for people: the comparison figures and the self-contained HTML export."""
