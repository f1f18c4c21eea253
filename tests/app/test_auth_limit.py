"""Failed token checks are rate-limited per user id (`app.users.Authenticator`): guessing
at a known id costs a bounded number of scrypt runs a second, and a client whose token
was verified before is never cut off by it."""

from __future__ import annotations

import app.users as users_module
from app.users import Authenticator, add_user, rotate_user, user_id_of


def test_guessing_at_a_user_id_runs_scrypt_a_bounded_number_of_times(api, monkeypatch):
    accounts = api.service.accounts
    user, token = add_user(accounts, "alice", "submit", None, api.clock[0])
    clock = [1000.0]
    auth = Authenticator(accounts, now=lambda: clock[0], failure_burst=3, failure_every_s=2.0)
    assert auth.authenticate(token) is not None  # alice's client, verified once
    runs = []
    real = users_module.token_matches
    monkeypatch.setattr(users_module, "token_matches", lambda t, s: runs.append(t) or real(t, s))
    guesses = [f"{user.user_id}.guess{i}" for i in range(10)]
    assert all(user_id_of(g) == user.user_id for g in guesses)
    assert [auth.authenticate(g) for g in guesses] == [None] * 10
    assert len(runs) == 3  # the burst; the other seven cost no scrypt
    # alice's running client is checked from the cache: not limited
    assert auth.authenticate(token) is not None
    # a token not verified before waits for the bucket, even a right one
    rotated = rotate_user(accounts, user, clock[0], 3600.0)
    assert rotated is not None
    assert auth.authenticate(rotated) is None
    assert len(runs) == 3
    clock[0] += 2.0  # one more try per 2 s
    assert auth.authenticate(rotated) is not None
    assert auth.authenticate(guesses[0]) is None  # that success spent nothing: one more try
    assert auth.authenticate(guesses[1]) is None
    # the rotated token's check, then one guess after the refill — tried against both
    # hashes of the rotation's overlap — and guess1 costs nothing
    assert runs[3:] == [rotated, guesses[0], guesses[0]]


def test_another_user_id_has_its_own_bucket(api):
    accounts = api.service.accounts
    alice, _ = add_user(accounts, "alice", "submit", None, api.clock[0])
    _, bob_token = add_user(accounts, "bob", "submit", None, api.clock[0])
    auth = Authenticator(accounts, now=lambda: 0.0, failure_burst=1)
    assert auth.authenticate(f"{alice.user_id}.nope") is None
    assert auth.authenticate(bob_token) is not None
