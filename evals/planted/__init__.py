"""Planted kernel bugs and correct kernel variants, armed inside the device-call boundary."""
