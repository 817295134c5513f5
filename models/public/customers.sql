-- The demo's example model: the SELECT that public.customers' sync reads (Jinja SQL).
-- It keeps the primary key (id) and the replication key (updated_at), and drops no rows.
SELECT id, name, lower(email) AS email, country_code, updated_at
FROM {{ source }}
