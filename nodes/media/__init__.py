"""Video and audio files: reading and writing them with PyAV (the runtime's codec layer)."""
