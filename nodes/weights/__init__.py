"""Weight files and the weight store: reading, key layouts, the process-wide store, storage precision (cast), merges, and writing models, latents and conditionings."""
