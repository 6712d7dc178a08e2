// A real OpenID Connect provider for gpuadmin's tests (tests/services.py starts it on loopback).
//
// node provider.js, configured by the environment:
//   PORT              where to listen (127.0.0.1)
//   CLIENT_ID, CLIENT_SECRET   the one client (gpuadmin), whose redirect URI is any
//                     http://<loopback or testserver>[:port]/oidc/callback/ (the tests' servers vary)
//   ACCOUNTS_FILE     JSON {"alice": {"password": "...", "email": "...", "groups": ["..."], "amr": [...]}},
//                     read again at every request, so a test changes someone's groups by rewriting it
// Its login page (GET /interaction/<uid>) asks for a user name and a password; a wrong one is
// answered with the page again and "Wrong user name or password". Consent is implied (one first-party
// client). It prints "listening <issuer>" once it serves.
import { generateKeyPairSync } from "node:crypto";
import { readFileSync } from "node:fs";
import http from "node:http";

import Provider from "oidc-provider";

const port = Number(process.env.PORT);
const issuer = `http://127.0.0.1:${port}`;
const accounts = () => JSON.parse(readFileSync(process.env.ACCOUNTS_FILE, "utf8"));

const { privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
const jwk = { ...privateKey.export({ format: "jwk" }), kid: "test-key", use: "sig", alg: "RS256" };

const provider = new Provider(issuer, {
  clients: [{
    client_id: process.env.CLIENT_ID,
    client_secret: process.env.CLIENT_SECRET,
    redirect_uris: ["http://127.0.0.1/oidc/callback/"],
    token_endpoint_auth_method: "client_secret_post",
    id_token_signed_response_alg: "RS256",
    require_auth_time: true,
  }],
  jwks: { keys: [jwk] },
  claims: {
    openid: ["sub", "amr"],  // amr: how the person signed in (the second-factor tests set it)
    email: ["email", "email_verified"],
    profile: ["preferred_username", "given_name", "family_name", "groups"],
  },
  pkce: { required: () => true },
  features: { devInteractions: { enabled: false } },
  cookies: { keys: ["test-cookie-key"] },
  ttl: { Session: 3600, Interaction: 600, Grant: 3600, AccessToken: 600, IdToken: 600, AuthorizationCode: 60 },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  async findAccount(ctx, id) {
    const account = accounts()[id];
    if (!account) return undefined;
    return {
      accountId: id,
      async claims() {
        return {
          sub: id, preferred_username: id, email: account.email, email_verified: true,
          given_name: id[0].toUpperCase() + id.slice(1), family_name: "Liddell", groups: account.groups,
        };
      },
    };
  },
  // One first-party client: what it asks for is granted without a consent page.
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({ clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId });
    grant.addOIDCScope("openid email profile");
    await grant.save();
    return grant;
  },
});
const CALLBACK = /^http:\/\/(127\.0\.0\.1|localhost|testserver)(:\d+)?\/oidc\/callback\/$/;
provider.Client.prototype.redirectUriAllowed = (uri) => CALLBACK.test(uri);
provider.on("server_error", (ctx, error) => console.error("server_error", error));

const escape = (text) => String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const loginPage = (uid, error) => `<!doctype html><html><head><title>Test provider: sign in</title></head><body>
<h1>Test provider</h1>${error ? `<p id="error">${escape(error)}</p>` : ""}
<form method="post" action="/interaction/${escape(uid)}">
<label>User name <input name="login" id="login" autofocus></label>
<label>Password <input name="password" id="password" type="password"></label>
<button type="submit" id="sign-in">Sign in</button></form></body></html>`;

const readBody = (req) => new Promise((resolve, reject) => {
  let body = "";
  req.on("data", (chunk) => { body += chunk; if (body.length > 10000) req.destroy(); });
  req.on("end", () => resolve(new URLSearchParams(body)));
  req.on("error", reject);
});

const callback = provider.callback();
const server = http.createServer(async (req, res) => {
  const match = /^\/interaction\/([\w-]+)$/.exec(req.url);
  if (!match) return callback(req, res);
  try {
    const details = await provider.interactionDetails(req, res);
    if (req.method === "GET") {
      res.writeHead(200, { "content-type": "text/html; charset=utf-8" });
      return res.end(loginPage(details.uid, ""));
    }
    const form = await readBody(req);
    const login = form.get("login") || "";
    const account = accounts()[login];
    if (!account || account.password !== form.get("password")) {
      res.writeHead(200, { "content-type": "text/html; charset=utf-8" });
      return res.end(loginPage(details.uid, "Wrong user name or password"));
    }
    // "amr" in a person's entry: how the provider says they signed in (["pwd", "otp"]: with a second factor).
    const result = { login: { accountId: login, ...(account.amr ? { amr: account.amr } : {}) } };
    await provider.interactionFinished(req, res, result, { mergeWithLastSubmission: false });
  } catch (error) {
    console.error("interaction", error);
    res.writeHead(400, { "content-type": "text/plain" });
    res.end(String(error));
  }
});
server.listen(port, "127.0.0.1", () => console.log(`listening ${issuer}`));
