"""The SD3 / SD3.5 family: the MMDiT model, its diffusers key map, the family object and its runner."""
