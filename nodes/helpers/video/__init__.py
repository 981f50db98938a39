"""Video helpers of the node library: video files (LoadVideo / SaveVideo, on nodes/media) and
video latents (the Wan latent nodes: [B, C, T, H, W])."""
