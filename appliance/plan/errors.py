"""PlanError: every problem with a configuration, reported at once."""

from __future__ import annotations


class PlanError(Exception):
    """A configuration that cannot be served as asked.

    `problems` holds one human sentence per problem, each naming the field and,
    where there is a fixed set, the valid choices.
    """

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        lines = [f"PlanError: {len(self.problems)} problem(s) with this configuration:"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)
