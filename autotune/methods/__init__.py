"""Speculative methods, one package each. A package defines ``ENTRY`` (an
``autotune.methods.base.Method`` or ``Expansion``): its name, the settings it writes to
the profile, its search space (``space.yaml``), how it tunes, how it builds its drafter,
and its exports.

Adding a method: write its package here, and add its name to ``registry.BUILTIN`` (the
registry line). Nothing else in autotune lists methods.
"""
