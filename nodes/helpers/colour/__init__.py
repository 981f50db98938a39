"""Colour values of the editor's newer widgets: curves and histograms (CurveEditor, ImageHistogram), colour-picker values (ColorToRGBInt)."""
