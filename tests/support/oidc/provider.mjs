// A real OpenID provider (node-oidc-provider) for llmgw's single sign-on tests.
//
//   node provider.mjs CONFIG.json
//
// CONFIG.json (written by tests/support/oidcproviders.py):
//   {"module": ".../node_modules/oidc-provider/lib/index.js",
//    "client": {client_id, client_secret, redirect_uris, post_logout_redirect_uris},
//    "jwks": {"keys": [a private JWK]},        // so the test can sign tokens of its own
//    "accounts": "accounts.json",              // {"<login>": {"groups": [...], ...}}
//    "conform": false}                         // true: claims at userinfo only
//
// Listens on 127.0.0.1, on a port the kernel picks, and prints one line,
// {"issuer": "http://127.0.0.1:PORT"}, once it serves. Logins use the
// provider's devInteractions page (any login, any password; the account is
// the login); the accounts file is read at each sign-in, so a test changes a
// person's groups by rewriting it. Consent is granted without asking.
import fs from 'node:fs';
import http from 'node:http';
import { pathToFileURL } from 'node:url';

const config = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const { default: Provider } = await import(pathToFileURL(config.module).href);

function accounts() {
  return JSON.parse(fs.readFileSync(config.accounts, 'utf8'));
}

const server = http.createServer();
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const issuer = `http://127.0.0.1:${server.address().port}`;

const provider = new Provider(issuer, {
  clients: [{
    ...config.client,
    response_types: ['code'],
    grant_types: ['authorization_code'],
    token_endpoint_auth_method: 'client_secret_basic',
  }],
  jwks: config.jwks,
  cookies: { keys: ['llmgw-test-cookie-key'] },
  pkce: { required: () => true },
  scopes: ['openid', 'profile', 'groups'],
  claims: {
    openid: ['sub'],
    profile: ['preferred_username', 'name'],
    groups: ['groups'],
  },
  // false: the groups in the ID token, as many providers put them; true ("conform" in
  // CONFIG.json): the code flow's ID token carries sub alone, the rest only at userinfo.
  conformIdTokenClaims: Boolean(config.conform),
  features: { devInteractions: { enabled: true }, rpInitiatedLogout: { enabled: true } },
  async findAccount(ctx, id) {
    const account = accounts()[id];
    if (!account) return undefined;
    return {
      accountId: id,
      async claims() {
        return { sub: id, preferred_username: account.preferred_username ?? id, ...account };
      },
    };
  },
  async loadExistingGrant(ctx) {
    const { Grant } = ctx.oidc.provider;
    const grant = new Grant({ clientId: ctx.oidc.client.clientId,
                              accountId: ctx.oidc.session.accountId });
    grant.addOIDCScope('openid profile groups');
    await grant.save();
    return grant;
  },
});
provider.on('server_error', (ctx, err) => console.error('server_error', err));
server.on('request', provider.callback());
process.stdout.write(JSON.stringify({ issuer }) + '\n');
process.on('SIGTERM', () => server.close(() => process.exit(0)));
