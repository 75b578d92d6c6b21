"""Issue 44 in process (inprocess.App, no workers): minted tokens within their parent's expiry and scope,
revocation down the tree, browser sessions distinct from API tokens, and cross-site form posts refused."""

from __future__ import annotations

import pytest

from inprocess import App

from circuitstat.core.errors import InputError
from circuitstat.pipelines.service import accounts
from circuitstat.pipelines.service.db import now

DAY = 86400.0


@pytest.fixture
def server(tmp_path):
    app = App(tmp_path / "data", users=("alice", "bob"))
    yield app
    app.close()


def _token(server: App, user: str, **kw) -> str:
    with server.svc.db.session() as s:
        return accounts.create_token(s, user, "test", **kw)


def _as(server: App, token: str, method: str, path: str, **kw):
    return server.client.request(method, path, headers={"Authorization": f"Bearer {token}"}, **kw)


def test_a_minted_tokens_expiry_and_scope_never_exceed_its_parents(server, monkeypatch):
    parent = _token(server, "alice", expires_at=now() + DAY)
    child = _as(server, parent, "POST", "/api/v1/tokens", json={"scope": "full"})  # no expiry asked: the parent's
    assert child.status_code == 201, child.text
    with server.svc.db.session() as s:
        p_row = accounts.token_row(s, parent)
    assert child.json()["expires_at"] == p_row.expires_at and child.json()["parent_id"] == p_row.id
    r = _as(server, parent, "POST", "/api/v1/tokens", json={"expires_in_days": 2})
    assert r.status_code == 422 and "outlive the token that mints it" in r.json()["detail"], r.text
    short = _as(server, parent, "POST", "/api/v1/tokens", json={"expires_in_days": 0.5, "scope": "read"})
    assert short.status_code == 201 and short.json()["expires_at"] < p_row.expires_at
    grandchild = _as(server, child.json()["token"], "POST", "/api/v1/tokens", json={})  # the chain keeps the bound
    assert grandchild.json()["expires_at"] == p_row.expires_at
    tokens = {"parent": parent, "child": child.json()["token"], "grandchild": grandchild.json()["token"]}
    for name, token in tokens.items():
        assert _as(server, token, "GET", "/api/v1/jobs").status_code == 200, name
    # the parent's expiry passes: every token it minted stops with it (the defect: the child went on working)
    later = p_row.expires_at + 1
    monkeypatch.setattr(accounts, "now", lambda: later)
    for name, token in tokens.items():
        assert _as(server, token, "GET", "/api/v1/jobs").status_code == 401, name
    # scope: a read token mints nothing (403), and a full token's child of a read parent is refused in the model
    monkeypatch.undo()
    read = _token(server, "alice", scope="read")
    assert _as(server, read, "POST", "/api/v1/tokens", json={"scope": "read"}).status_code == 403
    with server.svc.db.session() as s, pytest.raises(InputError, match="cannot mint a full token"):
        accounts.create_token(s, "alice", scope="full", parent=accounts.token_row(s, read))


def test_revoking_a_token_revokes_every_token_minted_from_it_and_rotation_keeps_them(server):
    root = _token(server, "alice")
    child = _as(server, root, "POST", "/api/v1/tokens", json={"scope": "full"}).json()
    grandchild = _as(server, child["token"], "POST", "/api/v1/tokens", json={"scope": "read"}).json()
    sibling = _token(server, "alice")  # made by the operator: no parent, untouched
    # rotating the child hands the grandchild to its replacement
    rotated = _as(server, root, "POST", f"/api/v1/tokens/{child['id']}/rotate").json()
    assert rotated["parent_id"] == child["parent_id"]
    assert _as(server, child["token"], "GET", "/api/v1/jobs").status_code == 401
    assert _as(server, grandchild["token"], "GET", "/api/v1/jobs").status_code == 200
    r = _as(server, sibling, "DELETE", f"/api/v1/tokens/{root.split('_')[1]}")
    assert r.status_code == 200 and r.json()["revoked"]
    for token in (root, rotated["token"], grandchild["token"]):
        assert _as(server, token, "GET", "/api/v1/jobs").status_code == 401
    assert _as(server, sibling, "GET", "/api/v1/jobs").status_code == 200
    listed = {t["id"]: t for t in _as(server, sibling, "GET", "/api/v1/tokens").json()}
    assert listed[grandchild["id"]]["revoked"] and listed[rotated["id"]]["revoked"]
