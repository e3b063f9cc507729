"""The corpus's programs are inputs of the check (and of launched runs), not test modules: pytest collects none."""

collect_ignore = ["corpus"]
