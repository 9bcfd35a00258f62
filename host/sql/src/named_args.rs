//! Named arguments (`name => value`) for Statebox's table functions.
//!
//! DataFusion plans a table function call in `FROM` from positional arguments only: it
//! refuses `read_statestore(stateVarName => 'count')`. So before planning, the parsed
//! statement is rewritten: every named argument of a Statebox table function becomes two
//! positional ones, a string literal holding [`NAME_MARK`] and the name, then the value
//! (`read_statestore('=>stateVarName', 'count')`). [`options`] reads them back, and can
//! tell a named argument from a positional one the user wrote.

use std::ops::ControlFlow;

use datafusion::common::ScalarValue;
use datafusion::logical_expr::Expr;
use datafusion::sql::parser::Statement;
use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, FunctionArg, FunctionArgExpr, Ident, ObjectNamePart, TableFactor,
    Value as SqlValue, VisitMut, VisitorMut,
};

/// The prefix that marks an encoded argument name.
pub(crate) const NAME_MARK: &str = "=>";

/// Rewrites the named arguments of calls to `functions` (lower-case names) in `statement`
/// to positional pairs, and spells those functions' names in lower case (the name the
/// function is registered under).
pub(crate) fn rewrite(statement: &mut Statement, functions: &[&str]) {
    let mut rewriter = Rewriter { functions };
    match statement {
        Statement::Statement(s) => {
            let _ = s.visit(&mut rewriter);
        }
        Statement::Explain(explain) => rewrite(&mut explain.statement, functions),
        // `CREATE EXTERNAL TABLE`, `COPY`, `RESET`: nothing to rewrite (and `statebox sql`
        // refuses them anyway).
        _ => {}
    }
}

struct Rewriter<'a> {
    functions: &'a [&'a str],
}

impl VisitorMut for Rewriter<'_> {
    type Break = ();

    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        let TableFactor::Table {
            name,
            args: Some(args),
            ..
        } = factor
        else {
            return ControlFlow::Continue(());
        };
        let [ObjectNamePart::Identifier(ident)] = name.0.as_mut_slice() else {
            return ControlFlow::Continue(());
        };
        let lower = ident.value.to_ascii_lowercase();
        if !self.functions.contains(&lower.as_str()) {
            return ControlFlow::Continue(());
        }
        *ident = Ident::new(lower);
        let mut positional = Vec::with_capacity(args.args.len() * 2);
        for arg in std::mem::take(&mut args.args) {
            match arg {
                FunctionArg::Named { name, arg, .. } => {
                    positional.push(marked_name(&name.value));
                    positional.push(FunctionArg::Unnamed(arg));
                }
                FunctionArg::ExprNamed {
                    name: SqlExpr::Identifier(name),
                    arg,
                    ..
                } => {
                    positional.push(marked_name(&name.value));
                    positional.push(FunctionArg::Unnamed(arg));
                }
                other => positional.push(other),
            }
        }
        args.args = positional;
        ControlFlow::Continue(())
    }
}

fn marked_name(name: &str) -> FunctionArg {
    let literal = SqlValue::SingleQuotedString(format!("{NAME_MARK}{name}"));
    FunctionArg::Unnamed(FunctionArgExpr::Expr(SqlExpr::value(literal)))
}

/// Reads a rewritten call's arguments back as `(name, value)` pairs, in the order given.
/// A positional argument is an error naming `function` and showing how to call it.
pub(crate) fn options<'e>(
    function: &str,
    usage: &str,
    exprs: &'e [Expr],
) -> Result<Vec<(String, &'e Expr)>, String> {
    let mut out = Vec::with_capacity(exprs.len() / 2);
    let mut rest = exprs.iter();
    while let Some(expr) = rest.next() {
        let name = match expr {
            Expr::Literal(ScalarValue::Utf8(Some(s)), _)
            | Expr::Literal(ScalarValue::Utf8View(Some(s)), _)
            | Expr::Literal(ScalarValue::LargeUtf8(Some(s)), _) => s.strip_prefix(NAME_MARK),
            _ => None,
        };
        let (Some(name), Some(value)) = (name, rest.next()) else {
            return Err(format!(
                "{function} takes named arguments only, found the positional argument {}; \
                 call it as {usage}",
                shown(expr)
            ));
        };
        out.push((name.to_owned(), value));
    }
    Ok(out)
}

/// The text of an option value for messages: literals as SQL would write them.
pub(crate) fn shown(value: &Expr) -> String {
    match value {
        Expr::Literal(ScalarValue::Utf8(Some(s)), _)
        | Expr::Literal(ScalarValue::Utf8View(Some(s)), _)
        | Expr::Literal(ScalarValue::LargeUtf8(Some(s)), _) => format!("'{s}'"),
        Expr::Literal(v, _) => v.to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::SessionContext;

    use super::*;

    fn rewritten(sql: &str) -> String {
        let ctx = SessionContext::new();
        let state = ctx.state();
        let dialect = state.config().options().sql_parser.dialect;
        let mut statement = state.sql_to_statement(sql, &dialect).unwrap();
        rewrite(&mut statement, &["read_statestore"]);
        statement.to_string()
    }

    #[test]
    fn named_arguments_become_marked_pairs() {
        assert_eq!(
            rewritten(
                "SELECT * FROM READ_STATESTORE(stateVarName => 'count', batchId => 3) AS s \
                 JOIN read_statestore(statevarname => 'x') t ON true"
            ),
            "SELECT * FROM read_statestore('=>stateVarName', 'count', '=>batchId', 3) AS s \
             JOIN read_statestore('=>statevarname', 'x') t ON true"
        );
        // Subqueries too; other functions and tables are left alone.
        assert_eq!(
            rewritten(
                "SELECT (SELECT count(*) FROM read_statestore(stateVarName => 'a')) FROM \
                 generate_series(1, 2)"
            ),
            "SELECT (SELECT count(*) FROM read_statestore('=>stateVarName', 'a')) FROM \
             generate_series(1, 2)"
        );
    }

    #[test]
    fn positional_arguments_are_refused() {
        let name = Expr::Literal(ScalarValue::Utf8(Some("=>batchId".into())), None);
        let value = Expr::Literal(ScalarValue::Int64(Some(3)), None);
        let positional = Expr::Literal(ScalarValue::Utf8(Some("count".into())), None);
        let args = [name.clone(), value.clone()];
        let got = options("f", "f(a => 1)", &args).unwrap();
        assert_eq!(got, [("batchId".to_owned(), &value)]);
        let err = options("f", "f(a => 1)", &[positional]).unwrap_err();
        assert!(
            err.contains("f takes named arguments only, found the positional argument 'count'"),
            "{err}"
        );
        assert!(err.contains("call it as f(a => 1)"), "{err}");
    }
}
