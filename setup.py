"""vpay-reconciler: the worker that decides how mobile-money payments end."""

from setuptools import find_packages, setup

setup(
    name="vpay",
    version="0.5.0",
    description="Reconciler worker for mobile-money payments: durable queue, poll ladder, signed webhooks",
    python_requires=">=3.11",
    # The top-level sql/ folder ships inside the package as vpay.sql, so a
    # plain (non-editable) install finds the migrations and named queries.
    packages=find_packages(include=["vpay", "vpay.*"]) + ["vpay.sql", "vpay.sql.queries"],
    package_dir={"vpay.sql": "sql", "vpay.sql.queries": "sql/queries"},
    package_data={"vpay.sql": ["*.sql"], "vpay.sql.queries": ["*.sql"],
                  "vpay.console": ["templates/*.html", "static/*"]},
    install_requires=[
        "psycopg[binary,pool]>=3.1",
        "requests>=2.31",
        "tenacity>=8.2",
        "click>=8.1",
        "python-json-logger>=3.1",
        "pgserver>=0.1.4",
        "falcon>=3.1",
        "gunicorn>=22",
        # Each gunicorn worker serves with waitress, which buffers a whole
        # request before a thread sees it (vpay/api/server.py, issue #27).
        "waitress>=3.0",
        # Webhook secrets sealed at rest: MultiFernet (vpay/base/secretbox.py).
        "cryptography>=42",
        "standardwebhooks>=1.0",
        "prometheus_client>=0.20",
        "openpyxl>=3.1",  # statements exported as .xlsx
        "argon2-cffi>=23.1",  # console operators' passwords (argon2id)
        "jinja2>=3.1",  # the console's server-rendered pages
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-xdist>=3.5",
            "responses>=0.25",
            "hypothesis>=6.100",
            "pytest-timeout>=2.2",
            "pyyaml>=6",
            # An independent published MoMo client the sandbox conformance test
            # drives (tests/unit/test_sandbox_published_client.py). Not mtnmomo: it
            # pins requests==2.21.0 and Click==7.0, which cannot install beside
            # vpay (docs/sandbox.md, "Conformance").
            "mtn-momo-client>=2.0.1,<3",
            # Independent checks of the merchant API's OpenAPI document: the
            # validator reads it as a spec, schemathesis fuzzes the live API
            # from it (tests/acceptance/test_merchant_api_schemathesis.py).
            "openapi-spec-validator>=0.7",
            "schemathesis>=4,<5",
            # The console's browser tests drive Debian's chromium (never
            # `playwright install`: tests/acceptance/test_console_browser.py).
            "playwright>=1.40",
            # A published Daraja client that drives the M-Pesa sandbox
            # (tests/unit/test_sandbox_new_rails.py, importorskip).
            "mpesakit>=2.2,<3",
        ],
        # bench/peers.py holds vpay against a peer queue in the same run; never
        # a runtime dependency.
        "bench": [
            "procrastinate>=3.10,<4",
        ],
    },
    entry_points={
        "console_scripts": [
            "vpay-server=vpay.cli:main",
            "vpay-worker=vpay.cli:worker_main",
        ],
    },
)
