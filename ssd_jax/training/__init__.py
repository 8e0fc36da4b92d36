"""Training the drafts: the EAGLE draft's feature cache and training loop (eagle_*), and the token-only draft
(ssd_jax/train.py)."""
