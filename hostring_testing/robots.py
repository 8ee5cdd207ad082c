"""Robots rules read by the oracle itself (RFC 9309), independently of hostring's robots policy.

The rules of the groups naming the user agent's product token apply (a user-agent value names the token its
leading letters, ``_`` and ``-`` spell, as the RFC's reference parser reads it: ``bot/1.0`` names ``bot``), else
those of ``*``; the longest matching pattern wins and Allow wins a tie; ``*`` and ``$`` work as RFC 9309 says;
patterns and paths are compared after percent-encoding normalisation. ``/robots.txt`` itself is always allowed.
"""

from __future__ import annotations

import re

from hostring_testing.identity import canonical_target, pct_normalize

__all__ = ["robots_allowed"]


def _robots_rules(text: str, user_agent: str) -> list[tuple[bool, str]]:
    """(allow, pattern) rules of the groups for `user_agent`: its own groups, else '*', else none."""
    token = user_agent.split("/", 1)[0].strip().lower()
    groups: list[tuple[list[str], list[tuple[bool, str]]]] = []
    in_agents = False
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        if key == "user-agent":
            if not in_agents:
                groups.append(([], []))
                in_agents = True
            groups[-1][0].append(value.lower())
        elif key in ("allow", "disallow"):
            in_agents = False
            if groups:
                groups[-1][1].append((key == "allow", value))
        else:
            in_agents = False if key != "sitemap" else in_agents
    own = [rules for agents, rules in groups if any(_names(agent, token) for agent in agents)]
    chosen = own or [rules for agents, rules in groups if any(_is_star(agent) for agent in agents)]
    return [rule for rules in chosen for rule in rules]


def _names(agent: str, token: str) -> bool:
    """Whether a lower-cased user-agent value names `token`: its leading letters, '_' and '-' are the token."""
    return agent[: len(agent) - len(agent.lstrip("abcdefghijklmnopqrstuvwxyz_-"))] == token


def _is_star(agent: str) -> bool:
    return agent == "*" or (agent.startswith("*") and agent[1:2].isspace())


def _rule_matches(pattern: str, path: str) -> bool:
    anchored = pattern.endswith("$")
    body = pattern[:-1] if anchored else pattern
    regex = ".*".join(re.escape(part) for part in body.split("*"))
    return re.match(regex + ("$" if anchored else ""), path) is not None


def robots_allowed(text: str, user_agent: str, path: str) -> bool:
    """Whether robots `text` lets `user_agent` fetch `path`+query: longest match wins, Allow wins ties."""
    if canonical_target(path) == "/robots.txt":
        return True
    target = pct_normalize(path)
    best: tuple[int, bool] | None = None
    for allow, pattern in _robots_rules(text, user_agent):
        if not pattern:
            continue
        pat = pct_normalize(pattern)
        if _rule_matches(pat, target):
            cand = (len(pat), allow)
            if best is None or cand > best:
                best = cand
    return best is None or best[1]
