"""ComfyUI compatibility: custom node packs, the host modules they import (comfy_host/, package data), ComfyUI's server flags and payloads."""
