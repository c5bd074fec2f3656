-- Each worker and client in a NATS account of its own (issue 23): a credential issued from now
-- on is signed by the identity's own account. One issued before was signed by palisade's own
-- account, with the permissions of that time (a client could create JetStream consumers there):
-- palisade's account refuses every such key from the next `palisade nats push` on, so the
-- holders need new credentials (`worker add --id … --creds …`, `client add --id … --creds …`).
ALTER TABLE nats_users ADD COLUMN IF NOT EXISTS own_account BOOLEAN NOT NULL DEFAULT false;

-- Older builds never read the column, and their inserts get the default, which is right for
-- them: they sign in palisade's account.
INSERT INTO backward_compatible_migrations (version, reason)
VALUES (20261202000021, 'adds a column with a default that older builds neither read nor need to write')
ON CONFLICT (version) DO NOTHING;
