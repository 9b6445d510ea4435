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


def unread(section: str, cfg, reads: dict[str, tuple[str, ...]], unset: dict, option: str,
           chosen: str, shown: str | None = None) -> list[str]:
    """One problem per field of `cfg` (config section `section`) set away from its unset value
    where the chosen `option` (e.g. model=tiny) does not read it: refused, never ignored.
    `reads`: the options each such field is read by; `shown`: the choice as the user wrote it,
    where that differs (cache=auto, here none)."""
    return [f"{section}.{f}={getattr(cfg, f)!r} is not read by {option}={shown or chosen}; it "
            f"applies to {option}={'|'.join(options)}"
            for f, options in reads.items()
            if chosen not in options and getattr(cfg, f) != unset[f]]
