"""The MTP styles (``mtp.style``), one folder each: what each builds, checks, counts, saves, exports and drafts with
(README.md here; the interface and the registry: config/mtp_style.py)."""
