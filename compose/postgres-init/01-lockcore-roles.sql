-- lockcore may end its own dropped waits' sessions (same role) and, for the
-- fault tests, any session holding a test name.
GRANT pg_signal_backend TO lockcore;
-- A password with +, space, @ and %, for the URL-decoding tests.
CREATE ROLE lockcore_plus LOGIN PASSWORD 'p+q r@s%t';
GRANT lockcore TO lockcore_plus;
-- A role that may use the lock table (the tests grant it) but not create
-- tables: PostgreSQL 15's default on the public schema for all but the
-- database's owner.
CREATE ROLE lockcore_dml LOGIN PASSWORD 'lockcore';
