"""An entry-point plugin of another distribution that ends the process when imported."""

import os

os._exit(7)
