"""A small labelled retrieval set: 35 short help-centre documents of a made-up hosting product and 27 queries, each
with the document that answers it.

The queries are of four kinds: worded like their document (keywords suffice), worded with synonyms the document does
not use (only the vector pass can bridge them, through fake_embeddings.SYNONYMS), mixed (an identifier or a rare
term next to paraphrase and words other documents share too), and bare identifiers (error codes, which the fake
model, like real ones, cannot tell apart). It measures
that the two passes and their fusion are wired and complement each other, not the quality of any real model.
"""

from __future__ import annotations

DOCUMENTS: dict[str, str] = {
    "password-reset.md": "# Resetting a password\nTo reset a forgotten password, open the sign-in page and choose"
    " 'Forgot password'.\nA reset link is emailed and expires after 30 minutes.",
    "refunds.md": "# Refunds\nRefunds are issued to the original card within 5 business days.\nAnnual plans can be"
    " refunded within 14 days of purchase.",
    "rate-limits.md": "# Rate limits\nThe API allows 600 requests per minute per token.\nExceeding the limit returns"
    " HTTP 429 with a Retry-After header.",
    "backups.md": "# Backups\nDatabases are snapshotted every night at 02:00 UTC and kept for 35 days.\nRestoring a"
    " snapshot creates a new instance.",
    "sso.md": "# Single sign-on\nSingle sign-on supports SAML 2.0 and OpenID Connect.\nAdministrators upload the"
    " identity provider metadata in the admin console.",
    "deploy.md": "# Deploying\nDeploy with `acme deploy --env production`.\nThe command builds the container, runs"
    " migrations and shifts traffic gradually.",
    "error-e4021.md": "# Error E4021\nError E4021 means the upload exceeded the workspace storage quota.\nDelete old"
    " artifacts or upgrade the plan.",
    "error-e5003.md": "# Error E5003\nError E5003 is raised when the worker cannot reach the message queue.\nIt"
    " retries with backoff for ten minutes.",
    "invoices.md": "# Invoices\nInvoices are generated on the first day of each month and sent to the billing"
    " contact.\nPDF copies are kept under Billing > History.",
    "two-factor.md": "# Two-factor authentication\nTwo-factor authentication can use an authenticator app or hardware"
    " security keys.\nRecovery codes are shown once.",
    "webhooks.md": "# Webhooks\nWebhooks deliver events as signed JSON POST requests.\nVerify the X-Acme-Signature"
    " header with your endpoint secret.",
    "delete-account.md": "# Closing an account\nClosing an account removes all projects after a 30 day grace"
    " period.\nThe owner must confirm by typing the workspace name.",
    "gpu.md": "# GPU instances\nGPU instances are available in three regions.\nEach instance has one card with 24 GB"
    " of memory.",
    "logs.md": "# Logs\nApplication logs are retained for 7 days on the free plan and 90 days on paid plans.\nExport"
    " them to object storage for longer storage.",
    "custom-domain.md": "# Custom domains\nTo use a custom domain, add a CNAME record pointing to edge.acme.dev.\nWait"
    " for the certificate to be issued.",
    "team-invite.md": "# Inviting teammates\nInvite teammates from the Members page.\nInvitations expire after 7 days"
    " and can be resent.",
    "roles.md": "# Roles\nRoles are Owner, Admin, Developer and Viewer.\nOnly Owners can change billing details or"
    " transfer the workspace.",
    "cli-install.md": "# Installing the CLI\nInstall the command-line tool with pip install acme-cli.\nThen run acme"
    " login to sign in.",
    "scaling.md": "# Autoscaling\nAutoscaling adds replicas when CPU stays above 70 percent for three minutes.\nIt"
    " removes them after ten quiet minutes.",
    "cron.md": "# Scheduled jobs\nScheduled jobs use cron syntax.\nThe shortest interval is one minute and jobs time"
    " out after fifteen minutes.",
    "env-vars.md": "# Environment variables\nEnvironment variables are set per environment.\nSecrets are encrypted at"
    " rest and never shown after saving.",
    "support-hours.md": "# Support hours\nSupport answers tickets Monday to Friday, 8:00 to 18:00 CET.\nEnterprise"
    " customers get a phone line around the clock.",
    "data-export.md": "# Exporting data\nExport all workspace data as a ZIP archive from the Data page.\nLarge exports"
    " are emailed as a download link.",
    "gdpr.md": "# Privacy\nPersonal data is processed in the EU.\nA data processing agreement is available for every"
    " paid plan.",
    "pricing.md": "# Pricing\nThe Starter plan costs 10 dollars per month; Pro costs 49 dollars.\nDiscounts apply to"
    " yearly billing.",
    "outage-status.md": "# Status page\nCheck status.acme.dev for incidents.\nSubscribe to get notified by email or"
    " SMS when an outage starts.",
    "ssh.md": "# SSH access\nConnect to an instance over SSH using the key uploaded in your profile.\nPassword"
    " sign-in is disabled.",
    "error-e1100.md": "# Error E1100\nError E1100 indicates an expired session token.\nSign in again to obtain a new"
    " one.",
    "error-e2001.md": "# Error E2001\nError E2001 means the build failed; the error message of the build step is"
    " shown above it.",
    "error-e3100.md": "# Error E3100\nError E3100 means the region is at capacity; try another region or wait.",
    "error-e6002.md": "# Error E6002\nError E6002 means the domain is already attached to another project.",
    "mobile-app.md": "# Mobile app\nThe mobile app shows deployments and notifications.\nPush notifications can be"
    " muted per project.",
    "vehicle-fleet.md": "# Fleet tracking\nFleet tracking records each vehicle's location every 30 seconds.\nTrips"
    " are stored for one year.",
    "trial.md": "# Free trial\nThe free trial lasts 14 days and needs no card.\nAt the end the workspace switches to"
    " the free plan.",
    "api-tokens.md": "# API tokens\nCreate API tokens on the Tokens page.\nTokens can be scoped to read-only access"
    " and revoked any time.",
}

# (query, the document that answers it, kind)
QUERIES: list[tuple[str, str, str]] = [
    ("reset a forgotten password", "password-reset.md", "keyword"),
    ("HTTP 429 Retry-After", "rate-limits.md", "keyword"),
    ("CNAME record for a custom domain", "custom-domain.md", "keyword"),
    ("cron syntax and shortest interval", "cron.md", "keyword"),
    ("SAML and OpenID Connect", "sso.md", "keyword"),
    ("how long are logs retained", "logs.md", "keyword"),
    ("invitations expire", "team-invite.md", "keyword"),
    ("export workspace data as ZIP", "data-export.md", "keyword"),
    ("how do I get a reimbursement", "refunds.md", "paraphrase"),
    ("recover a lost passphrase", "password-reset.md", "paraphrase"),
    ("throttling of API calls", "rate-limits.md", "paraphrase"),
    ("retention of nightly db copies", "backups.md", "paraphrase"),
    ("add colleagues to my organisation", "team-invite.md", "paraphrase"),
    ("automobile position history", "vehicle-fleet.md", "paraphrase"),
    ("graphics machines", "gpu.md", "paraphrase"),
    ("price of the professional tier", "pricing.md", "paraphrase"),
    ("when can I reach the helpdesk", "support-hours.md", "paraphrase"),
    ("where is my bill", "invoices.md", "paraphrase"),
    ("personal information stored in europe", "gdpr.md", "paraphrase"),
    ("E5003 worker queue unreachable retries", "error-e5003.md", "mixed"),
    ("session E1100 expired, sign in again", "error-e1100.md", "mixed"),
    ("upload refused with E4021 in my organisation", "error-e4021.md", "mixed"),
    ("downtime alerts by SMS", "outage-status.md", "mixed"),
    ("yubikey for account login", "two-factor.md", "mixed"),
    ("error E3100", "error-e3100.md", "identifier"),
    ("what does E6002 mean", "error-e6002.md", "identifier"),
    ("E2001", "error-e2001.md", "identifier"),
]
