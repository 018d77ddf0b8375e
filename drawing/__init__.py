"""Drawing helpers shared by the console and the simulator: plain SVG, no Django, no product code."""
