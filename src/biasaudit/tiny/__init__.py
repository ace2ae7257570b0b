"""Tiny random-weight stand-ins of the real model architectures, built offline (tests, offline demo).
Everything they produce is labelled stand-in."""
