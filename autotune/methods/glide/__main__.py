"""``python -m autotune.methods.glide PROFILE [--out FILE]``: a profile's GLIDE settings
for the GLIDE reference code (``autotune.methods.glide.export``)."""

import sys

from autotune.methods.glide.export import main

sys.exit(main())
