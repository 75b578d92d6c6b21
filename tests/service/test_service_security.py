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


def _logged_in(server: App, user: str):
    """A fresh browser-like client of ``server`` logged in as ``user`` (its session cookie kept)."""
    from fastapi.testclient import TestClient

    c = TestClient(server.app, base_url="http://testserver")
    r = c.post("/login", data={"token": server.tokens[user]}, headers={"Origin": "http://testserver"},
               follow_redirects=False)
    assert r.status_code == 303, r.text
    return c, r


def test_a_cross_site_form_post_is_refused_and_a_same_origin_one_works(server):
    job = server.add_job("alice")
    c, _ = _logged_in(server, "alice")
    refused = {"no Origin, no Referer": {}, "a foreign Origin": {"Origin": "http://evil.example"},
               "another port of this host": {"Origin": "http://testserver:8081"}, "Origin null": {"Origin": "null"},
               "a foreign Referer": {"Referer": "http://evil.example/form.html"}}
    for what, headers in refused.items():
        for action in ("delete", "cancel", "rerun"):
            r = c.post(f"/jobs/{job}/{action}", headers=headers, follow_redirects=False)
            assert r.status_code == 400 and "another site" in r.text, (what, action, r.status_code)
    assert server.get("alice", f"/api/v1/jobs/{job}").status_code == 200  # the job is still there
    r = c.post("/login", data={"token": server.tokens["bob"]}, headers={"Origin": "http://evil.example"})
    assert r.status_code == 400  # no login forced on a browser from another site either
    # the negative control: the same post from the server's own page (Origin, or only a Referer) goes through
    r = c.post(f"/jobs/{job}/delete", headers={"Referer": f"http://testserver/jobs/{job}"}, follow_redirects=False)
    assert r.status_code == 303, r.text
    assert server.get("alice", f"/api/v1/jobs/{job}").status_code == 410  # deleted: gone


def test_a_session_is_not_a_token_and_its_cookie_is_httponly_strict_and_secure_behind_tls(server):
    from fastapi.testclient import TestClient

    job = server.add_job("alice")
    token = server.tokens["alice"]
    # the raw bearer token as the session cookie: no page, no form, no API call
    c = TestClient(server.app, cookies={"circuitstat_session": token})
    assert c.get("/jobs", follow_redirects=False).status_code == 303  # to /login
    r = c.post(f"/jobs/{job}/delete", headers={"Origin": "http://testserver"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert c.get("/api/v1/jobs").status_code == 401
    assert server.get("alice", f"/api/v1/jobs/{job}").json()["state"] == "completed"  # not deleted
    # a session cookie is not a bearer token
    b, login = _logged_in(server, "alice")
    session = b.cookies.get("circuitstat_session")
    assert session.startswith("css_") and session != token
    assert b.get("/jobs", follow_redirects=False).status_code == 200  # the session opens pages
    r = server.client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {session}"})
    assert r.status_code == 401
    cookie = login.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "secure" not in cookie.replace("; path", "")
    tls = TestClient(server.app, base_url="https://testserver")
    r = tls.post("/login", data={"token": token}, headers={"Origin": "https://testserver"}, follow_redirects=False)
    assert r.status_code == 303 and "; secure" in r.headers["set-cookie"].lower()


def _serve(app, port: int):
    """``app`` under a real uvicorn on 127.0.0.1:``port`` in a thread (its lifespan already ran); the server."""
    import threading

    import uvicorn

    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_config=None))
    threading.Thread(target=srv.run, daemon=True).start()
    return srv


@pytest.mark.slow  # headless Chromium
def test_in_chromium_a_cross_site_form_cannot_delete_and_a_token_cookie_opens_nothing(server, tmp_path):
    """Another origin on this host (the same *site* to SameSite) posts a delete form into a logged-in browser:
    refused by the Origin check; the raw token planted as the cookie opens no page; the page's own form works."""
    import functools
    import http.server
    import threading
    import time

    import httpx
    from browser import chrome
    from selenium.webdriver.support.ui import WebDriverWait
    from support import free_port

    job, mine = server.add_job("alice"), server.add_job("alice")
    port, evil_port = free_port(), free_port()
    srv = _serve(server.app, port)
    site = f"http://127.0.0.1:{port}"
    (tmp_path / "evil.html").write_text(f'<form method="post" action="{site}/jobs/{job}/delete">'
                                        '<button type="submit" id="go">win a prize</button></form>')
    evil = http.server.ThreadingHTTPServer(("127.0.0.1", evil_port), functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=str(tmp_path)))
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        for _ in range(200):
            if srv.started:
                break
            time.sleep(0.05)
        with chrome() as driver:
            driver.get(site + "/login")
            driver.find_element("id", "token").send_keys(server.tokens["alice"])
            driver.find_element("id", "login").click()
            assert driver.find_element("id", "user").text == "alice"
            cookie = driver.get_cookie("circuitstat_session")
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["value"].startswith("css_")
            driver.get(f"http://127.0.0.1:{evil_port}/evil.html")
            driver.find_element("id", "go").click()
            WebDriverWait(driver, 60).until(lambda d: d.current_url.startswith(site))  # the post's answer arrived
            assert "another site" in driver.find_element("tag name", "body").text
            assert server.get("alice", f"/api/v1/jobs/{job}").status_code == 200  # not deleted
            driver.get(f"{site}/jobs/{mine}")  # the control: the page's own delete form works
            driver.find_element("id", "delete").click()
            WebDriverWait(driver, 60).until(lambda d: d.current_url.rstrip("/").endswith("/jobs"))  # redirected
            assert server.get("alice", f"/api/v1/jobs/{mine}").status_code == 410
            driver.delete_all_cookies()
            driver.add_cookie({"name": "circuitstat_session", "value": server.tokens["alice"], "path": "/"})
            driver.get(f"{site}/jobs/{job}")
            assert driver.current_url.endswith("/login")  # the bearer token is no session
        r = httpx.post(f"{site}/jobs/{job}/delete", cookies={"circuitstat_session": cookie["value"]})
        assert r.status_code == 400  # plain HTTP with the live session, no Origin nor Referer: refused too
        assert server.get("alice", f"/api/v1/jobs/{job}").status_code == 200
    finally:
        evil.shutdown()
        srv.should_exit = True
