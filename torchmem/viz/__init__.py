"""Pictures and summaries of memory snapshots, each a pure function of the snapshot dict.

- ``totals``: segsum-like totals (allocated, free internal, free external, reserved).
- ``timeline``: allocated, reserved and the largest free block over the history.
- ``png``: matplotlib pictures (the timeline; the map of segments).
- ``html``: a self-contained page (inline SVG and CSS, no script, no network).
- ``replays``: replay results side by side (allocated and reserved per setting, OOM marked).
"""
