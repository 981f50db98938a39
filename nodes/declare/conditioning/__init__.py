"""Conditioning nodes: text encoding, areas and masks, ControlNets, image and vision conditionings, weight hooks."""
