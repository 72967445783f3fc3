"""Publish the asv dashboard so that it works offline: ``python -m harness.dashboard [--serve]``.

asv's index.html pulls jQuery, flot, bootstrap... from CDNs.  After ``asv publish`` we copy the
vendored files of harness/dashboard_assets next to it and point every CDN link at them.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "results" / "html"
ASSETS = Path(__file__).with_name("dashboard_assets")
# basename in the CDN url -> vendored file
LOCAL = {
    "jquery-3.3.1.min.js": "jquery.min.js",
    "jquery.flot.min.js": "jquery.flot.js",
    "jquery.flot.time.min.js": "jquery.flot.time.js",
    "jquery.flot.selection.min.js": "jquery.flot.selection.js",
    "jquery.flot.categories.min.js": "jquery.flot.categories.js",
    "jquery.flot.orderBars.js": "jquery.flot.orderBars.js",
    "stupidtable.min.js": "stupidtable.min.js",
    "md5.min.js": "md5.min.js",
    "bootstrap.min.js": "bootstrap.min.js",
    "bootstrap.min.css": "bootstrap.min.css",
}
CDN_TAG = re.compile(r'(src|href)="https://[^"]*/([^"/]+)"((?:\s+(?:integrity|crossorigin|referrerpolicy)="[^"]*")*)')


def publish() -> int:
    rc = subprocess.run([sys.executable, "-m", "asv", "publish"], cwd=ROOT).returncode
    if rc == 0:
        vendorize(HTML)
    return rc


def vendorize(html_dir: Path) -> None:
    """Copy the vendored scripts into html_dir/vendor and rewrite CDN links in its html files."""
    (html_dir / "vendor").mkdir(exist_ok=True)
    for name in set(LOCAL.values()):
        shutil.copy(ASSETS / name, html_dir / "vendor" / name)
    for page in html_dir.glob("*.html"):
        text = page.read_text()

        def local(m: re.Match) -> str:
            name = LOCAL.get(m.group(2))
            return f'{m.group(1)}="vendor/{name}"' if name else m.group(0)

        page.write_text(CDN_TAG.sub(local, text))
        left = [u for u in re.findall(r'(?:src|href)="(https://[^"]+)"', page.read_text()) if "cdn" in u]
        if left:
            raise RuntimeError(f"{page}: CDN links without a vendored copy: {left}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help="then serve it on http://127.0.0.1:8080")
    args = parser.parse_args()
    rc = publish()
    if rc == 0 and args.serve:
        print("dashboard: http://127.0.0.1:8080/index.html  (Ctrl-C to stop)")
        subprocess.run([sys.executable, "-m", "http.server", "8080", "--bind", "127.0.0.1", "--directory", str(HTML)])
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
