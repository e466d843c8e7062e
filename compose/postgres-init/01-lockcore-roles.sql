-- lockcore may end its own dropped waits' sessions (same role) and, for the
-- fault tests, any session holding a test name.
GRANT pg_signal_backend TO lockcore;
-- A password with +, space, @ and %, for the URL-decoding tests.
CREATE ROLE lockcore_plus LOGIN PASSWORD 'p+q r@s%t';
GRANT lockcore TO lockcore_plus;
