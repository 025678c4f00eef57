"""The project's measurements of its own claims, run from a clone of the repository (`python -m benchmarks NAME`,
`make bench-NAME`), never installed with the proxy: the package does not import them."""
