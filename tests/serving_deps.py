"""The serving tests' packages, and the test modules a GPU host without them leaves uncollected
(tests/conftest.py; tests/test_serving_collection.py checks that the globs cover every test module
whose imports reach those packages). A module of its own: a test cannot import `conftest` by name,
since pytest registers every directory's conftest.py under that one name."""

SERVING_DEPS = ("fastapi", "uvicorn", "pydantic")
SERVING_TEST_GLOBS = (
    "entrypoints/openai/test_*.py",
    "entrypoints/cli/test_serve_args.py",
    "accuracy/test_arith_served.py",
)
